"""`train.backend=megatron`: megatron-core's GPTModel, parallel state, DDP and optimizer.

Modules: `checks` (config validation, no megatron import), `model` (TransformerConfig and layer
spec from the model/parallelism groups, SDPA core attention), `parallel` (process groups),
`convert` (HF <-> Megatron weights with TP/PP sharding), `logprobs` (vocab-parallel log-probs
and entropy, chunked), `runner` (one layout's models, pipeline schedule and collectives),
`trainer` (the TrainBackend, its RL and SFT steps), `critic` (PPO's value model, on the trainer's
runner), `export` (Hugging Face weights out), `checkpoint` (megatron's distributed checkpoints).
megatron.core is imported only by the modules that need it (about 6 s), never by `import slime_hydra`.
"""
