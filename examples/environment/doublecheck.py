"""verifiers' `doublecheck` example as a vkswarm environment (multiturn.py):
after the first answer the user asks "Are you sure?"; the episode ends after
the second turn, rewarded when that final answer is right."""
import re

from multiturn import MultiTurnEnv


def final_answer(text):
    found = re.findall(r"^\s*answer:\s*(.+?)\s*$", text, re.IGNORECASE | re.MULTILINE)
    return found[-1] if found else None


class DoubleCheck(MultiTurnEnv):
    def is_completed(self, messages, state):
        return state["turn"] >= 2

    async def env_response(self, messages, state):  # async, as in verifiers: awaited for you
        return [{"role": "user", "content": "Are you sure?"}], state

    def score(self, messages, state):
        first = final_answer(messages[1]["content"])
        last = final_answer(messages[-1]["content"])
        right = last is not None and last == str(state["answer"])
        return (1.0 if right else 0.0), {"changed_mind": first != last}


if __name__ == "__main__":
    DoubleCheck().serve()
