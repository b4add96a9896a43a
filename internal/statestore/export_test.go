package statestore

// The hot statements' texts, for the tests that read their plans.
const (
	ClaimKindsSQL     = claimKindsSQL
	ApplyOKRepliesSQL = applyOKRepliesSQL
)

// HotStatements are the statements an order passes through at every
// load, by name: the claims, the batched reply, and the submitter's
// insert, plain and with every optional part (attributes, deadlines,
// namespaces, a partition's fence).
func HotStatements() map[string]string {
	every := &insertArrays{attrOrder: []int32{1}, deadlineOrder: []int32{1}, namespaces: []string{DefaultNamespace}, buckets: []int32{0}}
	return map[string]string{
		"claim of kinds":         claimKindsSQL,
		"claim of any kind":      claimAnySQL,
		"claim of picked steps":  claimPickedSQL,
		"batched reply":          applyOKRepliesSQL,
		"insert":                 (&insertArrays{}).sql(),
		"insert with every part": every.sql(),
	}
}

// GaugeStatements are the supervisor's periodic reads of the live work,
// by name, with their arguments.
func GaugeStatements() map[string][]any {
	return map[string][]any{
		"keys in use": {keysInUseSQL, 20},
		"limits":      {listLimitsSQL},
		"stats":       {statsSQL},
	}
}
