"""Simulated multi-device parallelism inside one process: a world of ranks, collectives that count
the bytes each rank sends and receives and time themselves with an alpha-beta model, and the
parallelism strategies built on them (one module each)."""
