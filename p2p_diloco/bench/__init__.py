"""The measurements behind BENCHMARKS.md: `transport` (two processes on loopback against bare
ZeroMQ) and `swarm` (real islands against the simulator and data parallel)."""
