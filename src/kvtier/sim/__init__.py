"""Trace-driven simulation: trace readers, Belady/OPT, replay driver, cost model."""
