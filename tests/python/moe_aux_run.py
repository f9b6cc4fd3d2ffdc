"""One optimizer step of a real transformers Mixtral model (built from a config, no download) with its router
auxiliary (load-balancing) loss, captured with gradtrace.attach: `python moe_aux_run.py OUT AUX_COEF`. The loss is
the model's own `outputs.loss` (cross-entropy + router_aux_loss_coef x aux loss), so two runs that differ only in
AUX_COEF differ only in the auxiliary term's scale: what transformers #48690 (the aux loss x the DDP world size
under Trainer) does to a run. One process, seeded: same weights and data whatever the coefficient."""

import sys

import torch
from transformers import MixtralConfig, MixtralForCausalLM

import gradtrace

out, coef = sys.argv[1], float(sys.argv[2])
torch.manual_seed(0)
config = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                       output_router_logits=True, router_aux_loss_coef=coef, max_position_embeddings=64)
model = MixtralForCausalLM(config)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 64, (2, 16), generator=g)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cap = gradtrace.attach(model, out, optimizer=opt, loss_description=f"Mixtral loss, router_aux_loss_coef {coef}")
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
cap.record_step(loss)
opt.step()
cap.close()
