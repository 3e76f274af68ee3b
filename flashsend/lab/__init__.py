"""The lab: everything that drives a running stack to demonstrate or measure flashsend (demo,
bench, chaos, end-to-end runs, load generators, the worker pool they start). Nothing that
ships imports it."""
