"""What executes a scheduled step: the model runner, sampling (grammar masks, speculative drafts, prompt
logprobs included) and the guard on what a step may read. The engine schedules; the executor runs."""
