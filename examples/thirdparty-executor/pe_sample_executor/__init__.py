"""Sample third-party policy-engine executor: `sample-http`, a small net.http client."""
