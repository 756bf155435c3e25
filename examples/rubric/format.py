#!/usr/bin/env python3
"""A reward program of vkswarm (docs/rl.md "Reward programs"): is the completion's last line
"answer: N"? It reads one JSON request per line ({"prompt", "completion", "answer", "info"}) and
answers one line {"reward": R, "metrics": {...}} each, flushed, for as long as vkswarm keeps it
running."""
import json
import re
import sys

for line in sys.stdin:
    request = json.loads(line)
    last = request["completion"].strip().splitlines()[-1:] or [""]
    formatted = re.fullmatch(r"answer: *-?[0-9]+", last[0].strip()) is not None
    print(json.dumps({"reward": 1.0 if formatted else 0.0, "metrics": {"formatted": formatted}}), flush=True)
