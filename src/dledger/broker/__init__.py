"""Controller mode, part 2 (issue 14): broker replica sets — AutoSwitch HA replication."""
