"""asyncio runtime: transport, server and client around the pure Raft core."""
