"""Multi-turn agentic rollouts: a custom generate hook, tool environments and the multi-turn loop.

hook.py holds the contract of `rollout.custom_generate` and the RolloutBackend wrapper that runs it;
env.py the tool/environment Protocol; multi_turn.py the loop (model turn, tool call, observation);
trajectory.py the token/mask/log-prob bookkeeping; calculator.py the CPU example.
"""
