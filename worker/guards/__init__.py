"""Accuracy guards: scoring base and head against the pinned fp32 reference (`scoring`) and the
arithmetic it runs on the worker's own device (`arith`)."""
