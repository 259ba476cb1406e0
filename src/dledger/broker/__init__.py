"""Controller mode, part 2 (docs/brokers.md): broker replica sets — AutoSwitch HA replication."""
