"""Run a verifiers-style multi-turn environment under vkswarm's environment
protocol (docs/rl.md "Environments"), without the verifiers package.

A verifiers MultiTurnEnv is written as three methods over the conversation
(`messages`, a list of {"role", "content"}) and a per-rollout `state` dict:
setup_state(state), is_completed(messages, state) and env_response(messages,
state) -> (new messages, state), plus a rubric that scores the finished
rollout. Subclass MultiTurnEnv below with the same methods (plain or async),
add score(messages, state) -> reward or (reward, metrics), and end your file
with `MyEnv().serve()`: the class speaks the JSON lines, keeps one
(messages, state) per episode, and forgets an episode once it is done.

What maps to what:
  reset {"task", "seed"}       -> state = {"prompt", "answer", "info", "seed",
                                  "turn": 0}; setup_state(state); the start
                                  is initial_messages(state) (default: the
                                  task's prompt as one user message)
  step {"completion"}          -> the turn appended as an assistant message;
                                  if is_completed: done, reward = score(...);
                                  else env_response's messages are appended
                                  and sent (and is_completed asked again)
Everything must depend only on the task, the seed and the turns: vkswarm
replays episodes to verify them (draw randomness from state["seed"])."""
import asyncio
import inspect
import json
import sys


def _call(f, *args):
    r = f(*args)
    return asyncio.run(r) if inspect.isawaitable(r) else r


class MultiTurnEnv:
    def initial_messages(self, state):
        return [{"role": "user", "content": state["prompt"]}]

    def setup_state(self, state):
        return state

    def is_completed(self, messages, state):
        raise NotImplementedError

    def env_response(self, messages, state):
        raise NotImplementedError

    def score(self, messages, state):
        raise NotImplementedError

    def _reset(self, q, episodes):
        task = q["task"]
        state = {"prompt": task.get("prompt") or "", "answer": task.get("answer"), "info": task.get("info"),
                 "seed": q["seed"], "turn": 0}
        state = _call(self.setup_state, state) or state
        messages = list(_call(self.initial_messages, state))
        episodes[q["episode"]] = (messages, state)
        return {"messages": messages}

    def _finish(self, q, episodes, messages, state):
        del episodes[q["episode"]]
        scored = _call(self.score, messages, state)
        reward, metrics = scored if isinstance(scored, tuple) else (scored, {})
        return {"messages": [], "done": True, "reward": float(reward), "metrics": metrics}

    def _step(self, q, episodes):
        messages, state = episodes[q["episode"]]
        messages.append({"role": "assistant", "content": q["completion"]})
        state["turn"] += 1
        if _call(self.is_completed, messages, state):
            return self._finish(q, episodes, messages, state)
        new, state = _call(self.env_response, messages, state)
        episodes[q["episode"]] = (messages, state)
        messages.extend(new)
        if _call(self.is_completed, messages, state):  # e.g. the environment ended it in its reply
            return self._finish(q, episodes, messages, state)
        return {"messages": new, "done": False}

    def serve(self, stdin=sys.stdin, stdout=sys.stdout):
        episodes = {}
        for line in stdin:
            q = json.loads(line)
            a = self._reset(q, episodes) if q["type"] == "reset" else self._step(q, episodes)
            stdout.write(json.dumps(a) + "\n")
            stdout.flush()
