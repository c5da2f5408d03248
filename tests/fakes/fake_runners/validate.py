"""Stand-in validate runner (see fake_runners)."""
from fake_runners._common import main

if __name__ == "__main__":
    main("validate")
