"""The ground floor: what every tier above imports (errors and flag names, the names the
CLI needs without torch, the --out rules, one forward pass, the non-finite watch, the
memory meter, the seed phases) and nothing of amptrain above it."""
