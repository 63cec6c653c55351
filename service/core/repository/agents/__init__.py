"""Repository agents (Triton's TRITONREPOAGENT API, in Python): code that runs when a model is loaded or unloaded
(check, decrypt, convert its files), named in config.pbtxt's `model_repository_agents`.

model.py (AgentModel: the model as an agent sees it), checksum.py (Triton's checksum agent), chain.py (finding
agents and running their actions in Triton's order)."""
