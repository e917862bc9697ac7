"""Published studies: publishing cells into results/published/, re-running and verifying them, and watching them in CI."""
