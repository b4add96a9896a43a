package broker

import (
	"regexp"
	"testing"
)

// In a partitioned deployment sharing one set of users, each service may
// reach every partition's names as it may its own, and no other
// deployment's; applications and sasctl reach the routing exchange.
func TestPartitionedPermissionsReachEveryPartition(t *testing.T) {
	t.Parallel()
	perms := PartitionedPermissions([]string{"sas.p1.", "sas.p2."}, "sas.route")
	of := map[string]Permission{}
	for _, p := range perms {
		of[p.Service] = p
	}
	check := func(service, what, re, name string, want bool) {
		t.Helper()
		if got := regexp.MustCompile(re).MatchString(name); got != want {
			t.Errorf("%s's %s %q on %q: %v, want %v", service, what, re, name, got, want)
		}
	}
	// A submitter passes submits on to the other partitions' entrances.
	check("submitter", "write", of["submitter"].Write, "sas.p2.submit", true)
	check("submitter", "write", of["submitter"].Write, "sas.p3.submit", false)
	check("submitter", "write", of["submitter"].Write, "sasxp1.submit", false)
	check("submitter", "configure", of["submitter"].Configure, "sas.p1.submit", true)
	// The API signals every partition and follows its status events.
	check("api", "write", of["api"].Write, "sas.p2.signals", true)
	check("api", "read", of["api"].Read, "sas.p1.status", true)
	// Applications publish to the routing exchange, not its buckets.
	check("app", "write", of["app"].Write, "sas.route", true)
	check("app", "write", of["app"].Write, "sas.p1.submit", true)
	check("app", "write", of["app"].Write, "sas.route.bucket.017", false)
	check("app", "configure", of["app"].Configure, "sas.p2.client.abc", true)
	// sasctl declares and binds the routing exchange and its buckets.
	check("sasctl", "configure", of["sasctl"].Configure, "sas.route", true)
	check("sasctl", "configure", of["sasctl"].Configure, "sas.route.bucket.017", true)
	check("sasctl", "write", of["sasctl"].Write, "sas.route.bucket.017", true)
	check("sasctl", "write", of["sasctl"].Write, "sas.p2.submit", true)
	check("sasctl", "read", of["sasctl"].Read, "sas.route", true)
	check("sasctl", "read", of["sasctl"].Read, "sas.route.bucket.017", true)
	check("sasctl", "configure", of["sasctl"].Configure, "sas.routex", false)
	// One prefix alone is Permissions'.
	if one := PartitionedPermissions([]string{"sas."}, "sas.route"); regexp.MustCompile(one[0].Write).MatchString("sas.p1.submit") {
		t.Error("a deployment of one prefix reaches another's")
	}
}
