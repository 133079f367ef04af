"""How a verdict becomes an attribution: the deterministic and LLM reasoners, the Diagram of Thought, evidence items, key extraction, ties."""
