package statestore

// The hot statements' texts, for the tests that read their plans.
const (
	ClaimKindsSQL     = claimKindsSQL
	ApplyOKRepliesSQL = applyOKRepliesSQL
)
