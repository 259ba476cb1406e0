"""The Raft state machine, pure and deterministic: no asyncio, no sockets, no clock.

The runtime (or a simulation) feeds `Node` requests, responses, ticks and
durability notices with the current time, and executes the actions it returns.
"""
