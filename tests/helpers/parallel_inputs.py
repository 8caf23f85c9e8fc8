"""Inputs shared by the data-parallel test (test_models.py) and its subprocess (parallel_worker.py)."""

PARALLEL_PROMPTS = ["t5 t6 t7", "t9", "t10 t11 t12 t13 t14"]  # 3 rows: padded to 4, split over 2 devices
PARALLEL_LABELS = ["t4", "t50", "t96"]
PARALLEL_TEXTS = ["t5 t6", "t7 t8 t9 t10", "t11"]
