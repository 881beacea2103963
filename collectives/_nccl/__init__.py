"""The NCCL backend on cupy.cuda.nccl: its verbs, flight watch, device helpers, rules, groups and NaN flags."""
