"""The Raft state machine, pure and deterministic: no asyncio, no sockets, no clock.

The runtime (or a simulation) feeds `Node` requests, responses, ticks and
durability notices with the current time, and executes the actions it returns.
"""

# core.messages first, whichever core module is imported first: it imports core.membership's wire
# structs for its request tables once its own Msg and field types (which membership uses) exist
from dledger.core import messages as _messages  # noqa: F401
