"""Benchmarks of fedfactor's simulator, each a ratio measured within one process.

Run them with `python -m benchmarks [NAME ...] [--quick]` (see benchmarks/__main__.py). Each module
benchmarks/<name>.py exposes DESCRIPTION and run(quick, device) -> rows; ratios are reported, never
asserted in tests, since timings depend on the machine and on what else it is doing.
"""
