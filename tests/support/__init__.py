"""What the tests share: where the repository's test data lives and one raw wire client."""
