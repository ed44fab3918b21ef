"""`h3bridge serve`: the OpenAI Videos API over h3bridge's engines.

wire.py owns the mapping between a GenerationRequest and the API's bodies (both ways) and the
job objects; it needs only pydantic, so clients (RemoteEngine) use it without the server stack.
The server itself (FastAPI + uvicorn, the `serve` extra) is in app.py, its durable job queue in
jobs.py, uploads in uploads.py, the engine worker in worker.py, and the command in command.py.
The peers' dialects (vLLM-Omni, SGLang): what they take and answer, and h3bridge requests written
in their words for RemoteEngine, in peer_wire.py (pydantic only, like wire.py); the server's
translation of their bodies and its answers in their shapes in dialects.py.
"""
