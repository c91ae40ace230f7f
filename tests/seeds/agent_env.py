"""Document 002's AgentEnv ("An action protocol the model can emit as text"), verbatim but for
its import lines and the body of ``run_tool``.

The import lines changed ``freesolo.datasets`` / ``freesolo.environments`` to
``llm_gym.datasets`` / ``llm_gym.environments``. ``run_tool`` is the document's placeholder
("your task-specific tool or service"); it got a real body: a tiny in-memory order service.
Keep the rest byte-for-byte (``fmt: off`` keeps the document's layout).
"""

# ruff: noqa
# fmt: off
import json, re
from llm_gym.datasets import TaskExample
from llm_gym.environments import (
    EnvironmentEpisode,
    EnvironmentMultiTurn,
    EnvironmentStepResult,
    RewardResult,
)

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

ORDERS = {"A1001": {"order_id": "A1001", "item": "kettle", "total": 42.5, "status": "delivered"}}


def run_tool(name: str, args: dict) -> dict:
    # your task-specific tool or service (here: a tiny in-memory order service; refunds are
    # idempotent and change no shared state, as document 002 asks of replayed effects)
    order = ORDERS.get(str(args.get("order_id", "A1001")))
    if order is None:
        return {"error": f"no order {args.get('order_id')!r}"}
    if name == "get_order":
        return dict(order)
    if name == "refund_order":
        return {"order_id": order["order_id"], "refunded": order["total"], "status": "refunded"}
    return {"error": f"unknown tool {name!r}"}

class AgentEnv(EnvironmentMultiTurn):
    def __init__(self, *, split: str = "train") -> None:
        self.dataset = [{"input": "Refund my last order.", "output": "refund_order"}]

    def start_episode(self, example: TaskExample, prompt_text: str):
        rules = (
            "Call tools with <tool_call>{...}</tool_call>; "
            "reply in plain text when done."
        )
        return [
            {"role": "system", "content": f"{prompt_text}\n\n{rules}".strip()},
            {"role": "user", "content": example.input},
        ]

    def max_episode_turns(self, example: TaskExample) -> int:
        return 8

    def step_episode(self, example, messages, assistant_response):
        blocks = TOOL_CALL.findall(assistant_response)
        if blocks:  # a TOOL turn: run the calls, feed results back, stay open
            results = [run_tool(**json.loads(b)) for b in blocks]
            return EnvironmentStepResult(
                done=False,
                messages=({"role": "user", "content": f"<tool_result>{json.dumps(results)}</tool_result>"},),
            )
        # a REPLY turn: no tool call -> the model is done
        return EnvironmentStepResult(done=True, final_response_text=assistant_response)

    def score_episode(self, example: TaskExample, episode: EnvironmentEpisode) -> RewardResult:
        used = [json.loads(b)["name"] for m in episode.messages
                for b in TOOL_CALL.findall(m["content"]) if m["role"] == "assistant"]
        hit = str(example.output) in used
        return RewardResult(score=1.0 if hit else 0.0, threshold=1.0)

def load_environment(split: str = "train", **kwargs) -> AgentEnv:
    return AgentEnv(split=split)
