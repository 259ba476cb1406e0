"""Benchmarks that hold dledger to its performance targets on the machine at hand."""
