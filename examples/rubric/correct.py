#!/usr/bin/env python3
"""A reward program of vkswarm: is the number after the last "answer:" the task's answer?
Partial credit for being close: 1 / (1 + |difference|)."""
import json
import re
import sys

for line in sys.stdin:
    request = json.loads(line)
    found = re.findall(r"answer: *(-?[0-9]+)", request["completion"])
    metrics = {"answered": bool(found)}
    reward = 0.0
    if found and request["answer"] is not None:
        difference = abs(int(found[-1]) - int(request["answer"]))
        reward = 1.0 / (1.0 + difference)
        metrics["difference"] = difference
    print(json.dumps({"reward": reward, "metrics": metrics}), flush=True)
