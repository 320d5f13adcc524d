"""Speed and memory benchmarks (not timed tests); run them all with ``python -m benchmarks.run``."""
