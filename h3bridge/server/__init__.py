"""`h3bridge serve`: the OpenAI Videos API over h3bridge's engines.

The bodies it answers in are the wire's (h3bridge/wire: the request mapping, the job objects,
the peers' models and the progress events), which RemoteEngine imports too, never this package.
The server itself (FastAPI + uvicorn, the `serve` extra) is assembled in app.py from routes/ (one
module per concern) over one AppState (state.py), guards.py and answers.py; its durable job queue in
jobs.py, uploads in uploads.py, the engine worker in worker.py, and the command `h3bridge serve` in cli/serve.py.
The server's translation of the peers' bodies (vLLM-Omni, SGLang) and its answers in their
shapes are in dialects.py; the event hub the worker publishes progress into in progress_feed.py.
"""
