"""Actor side: env loop with the algorithm's policy and assembler, streaming client."""
