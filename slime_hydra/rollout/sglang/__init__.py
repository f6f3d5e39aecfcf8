"""`rollout.backend=sglang`: real SGLang servers (one per engine) behind the real sglang-router.

Modules: `server_args` (ServerArgs field names read from sglang's source without importing it, the
pass-through check, the launch command), `process` (owned child processes: free ports, log files,
no orphans), `engines` (engine + router lifecycle, health monitor, restart), `client` (async HTTP
generate with concurrency limits, timeouts, bounded retries), `weights` (bucketed weight sync from
tensors or disk, the equality check), `distributed` (weight sync over a gloo/NCCL update group),
`backend` (the RolloutBackend). Nothing here imports sglang
at module import time; only weight sync from tensors and the equality check do, when used.
"""
