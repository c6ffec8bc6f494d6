"""The echo engine: `python -m tests.integration.echo_kind.engine PORT MODEL`."""

from __future__ import annotations

import sys

from aiohttp import web


def app(model: str) -> web.Application:
    served = {"requests": 0}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("model") != model:
            return web.json_response({"why": "no such model"}, status=404)
        served["requests"] += 1
        words = str(body["prompt"]).split()[: int(body["n"])]
        return web.json_response({"output": " ".join(reversed(words)), "tokens": len(words)})

    async def alive(request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def stats(request: web.Request) -> web.Response:
        text = f'echo_queue{{model="{model}"}} 0\necho_busy{{model="{model}"}} 0\n'
        text += f"echo_served_total {served['requests']}\n"
        return web.Response(text=text)

    application = web.Application()
    application.add_routes([web.post("/echo/generate", generate), web.get("/alive", alive),
                            web.get("/stats", stats)])  # fmt: skip
    return application


if __name__ == "__main__":
    web.run_app(app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None)
