"""sailor's training runtime: any plan, trained with torch + megatron-core.

One concept per module: topology (who is where, process groups), model
(stages on megatron layers), sharding (local slice <-> logical tensor), p2p
(resharding between stages), schedule (1F1B), loss, precision (bf16/fp16
with fp32 main gradients and masters, loss scaling), devices (where
communicated tensors live, strict mode), grad_sync, optimizer,
data (training samples), tokenizer and prepare (`sailor data prepare`),
checkpoint (on disk), snapshot (in host memory, written in the background),
and train (the entry point). compat holds the few shims
megatron-core needs on CPU. elastic/ is the worker side of `sailor run`.
"""
