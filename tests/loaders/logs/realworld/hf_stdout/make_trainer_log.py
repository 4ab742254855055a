import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging
logging.set_verbosity_info()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
data = [{"input_ids": torch.randint(0, 32, (16,)), "labels": torch.randint(0, 32, (16,))} for _ in range(16)]
args = TrainingArguments(output_dir=sys.argv[1], max_steps=6, per_device_train_batch_size=4, logging_steps=2,
                         eval_strategy="steps", eval_steps=3, save_strategy="no", learning_rate=1e-3,
                         weight_decay=0.05, seed=7, report_to=[], use_cpu=True)
print(args)
t = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
r = t.train()
t.save_metrics("train", r.metrics)
t.save_metrics("eval", t.evaluate())
t.save_state()
