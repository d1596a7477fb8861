"""Actor side: env loop, n-step transition assembly, streaming client."""
