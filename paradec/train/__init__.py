"""Training recipes: tokenizer, target LM, SSM pool (boost-tuning). Resumable, logged."""
