"""`train.backend=megatron`: megatron-core's GPTModel, parallel state, DDP and optimizer.

Modules: `checks` (config validation, no megatron import), `model` (TransformerConfig and layer
spec from the model/parallelism groups, SDPA core attention), `parallel` (process groups),
`convert` (HF <-> Megatron weights with TP/PP sharding), `logprobs` (vocab-parallel log-probs
and entropy, chunked), `backend` (the TrainBackend). megatron.core is imported only inside
`model`, `parallel`, `logprobs` and `backend` (about 6 s), never by `import slime_hydra`.
"""
