"""A multi-turn tool environment for vkswarm (docs/rl.md "Environments"): the
calculator of the built-in `calc` task, written as a user would write their
own. It reads one JSON request per line and answers one line:

  {"type": "reset", "episode": E, "seed": S, "task": {"prompt", "answer", "info"}}
      -> {"messages": [...]}                      the conversation's start
  {"type": "step", "episode": E, "completion": TEXT}
      -> {"messages": [...], "done": bool, "reward": R, "metrics": {...}}

A turn with an "answer:" line ends the episode (reward 1 when the number is
the task's answer); else its last "calc: EXPR" line gets "= VALUE" back as a
tool message; a turn with neither ends it with reward 0. Everything depends
only on the task, the seed and the turns, as vkswarm requires (a verifier
replays the episode and compares)."""
import ast
import json
import sys
from decimal import Decimal, InvalidOperation
from fractions import Fraction

OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
       ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def value(node):
    """Integers, + - * / and parentheses, exactly; anything else raises."""
    if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value < 2**31:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](value(node.left), value(node.right))
    raise ValueError("not allowed")


def calculate(expr):
    try:
        v = value(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return "error: not an expression of integers, + - * / and parentheses"
    return "= %d" % v.numerator if v.denominator == 1 else "= %d/%d" % (v.numerator, v.denominator)


def last_line(text, prefix):
    found = None
    for line in text.split("\n"):
        line = line.strip(" \t\r")
        if line[:len(prefix)].lower() == prefix:
            found = line[len(prefix):].strip(" \t\r")
    return found


def same_number(a, b):
    try:
        return Decimal(a.replace(",", "")) == Decimal(b.replace(",", ""))
    except InvalidOperation:
        return False


episodes = {}  # episode -> {"answer", "calls"}; forgotten when done
for line in sys.stdin:
    q = json.loads(line)
    if q["type"] == "reset":
        episodes[q["episode"]] = {"answer": q["task"]["answer"], "calls": 0}
        answer = {"messages": [{"role": "user", "content": q["task"]["prompt"]}]}
    else:
        state, text = episodes[q["episode"]], q["completion"]
        got, expr = last_line(text, "answer:"), last_line(text, "calc:")
        if got is not None or expr is None:  # the end: answered, or neither
            del episodes[q["episode"]]
            right = got is not None and same_number(got, state["answer"])
            answer = {"messages": [], "done": True, "reward": 1.0 if right else 0.0,
                      "metrics": {"calls": state["calls"]}}
        else:
            state["calls"] += 1
            answer = {"messages": [{"role": "tool", "content": calculate(expr)}], "done": False}
    print(json.dumps(answer), flush=True)
