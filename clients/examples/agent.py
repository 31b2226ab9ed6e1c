"""A multi-turn agent over one radixd session, forking 4 parallel steps from its shared context.

    python clients/examples/agent.py --address 127.0.0.1:50051

The agent keeps a session (system prompt + task), takes a planning turn, then forks the session into 4
children that each work on one step in parallel. Every step prints how many of its prompt tokens the
daemon served from the prefix cache: the forks share the parent's context copy-on-write, so only each
step's new tokens are computed. Finally the agent takes one more turn on the parent session.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from radixd_client import AsyncClient, AsyncSession

SYSTEM = "You are a careful planning agent. Keep every answer under two sentences."
TASK = "Task: organise a small open-source sprint for four contributors over one weekend."
STEPS = ("choose the issues", "set up the environment", "review the pull requests", "write the summary")


async def turn(session: AsyncSession, text: str, label: str, max_tokens: int) -> str:
    t0 = time.perf_counter()
    done = await session.send(
        [{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0.0
    ).collect()
    end = done.ends[0]
    print(
        f"{label:<28} prompt={done.prompt_tokens:5d} cached={done.cached_tokens:5d}"
        f" new={done.prompt_tokens - done.cached_tokens:4d} out={end.completion_tokens:3d}"
        f" ttft={end.ttft_s * 1000:7.1f}ms total={(time.perf_counter() - t0) * 1000:7.1f}ms"
    )
    return done.text


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    async with AsyncClient(args.address, api_key=args.api_key) as client:
        session = await client.create_session([{"role": "system", "content": SYSTEM}])
        print(f"session {session.id}")
        await turn(session, TASK + " Outline the plan in four steps.", "plan (parent)", args.max_tokens)
        children = await session.fork(len(STEPS))
        await asyncio.gather(
            *(
                turn(
                    child,
                    f"Work on step {i + 1}: {step}.",
                    f"step {i + 1} (fork {child.id})",
                    args.max_tokens,
                )
                for i, (child, step) in enumerate(zip(children, STEPS, strict=True))
            )
        )
        await turn(session, "Summarise the plan in one sentence.", "summary (parent)", args.max_tokens)
        for child in children:
            await child.close()
        await session.close()


if __name__ == "__main__":
    asyncio.run(main())
