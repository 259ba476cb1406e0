"""Controller mode (docs/controller.md): a controller that elects masters for broker replica
sets, on a dledger group whose state machine is the controller state (upstream's ReplicasInfoManager)."""
