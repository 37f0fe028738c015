"""The interactor: reads the secret from the input file, answers the submission's guesses."""

import sys

with open(sys.argv[1]) as given:
    secret = int(given.read())
for _ in range(7):
    line = sys.stdin.readline()
    if not line:
        sys.exit(43)
    guess = int(line)
    if guess == secret:
        print("correct", flush=True)
        sys.exit(42)
    print("lower" if secret < guess else "higher", flush=True)
sys.exit(43)
