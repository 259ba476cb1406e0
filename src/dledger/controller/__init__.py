"""Controller mode (issue 13, seed 001): a controller that elects masters for broker replica
sets, on a dledger group whose state machine is the controller state (CONTROLLER.md)."""
