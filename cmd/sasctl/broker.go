package main

import (
	"context"
	"fmt"
	"strings"

	"sas/internal/broker"
)

// brokerUsers prints the rabbitmqctl commands that create one user per
// service with only the permissions it needs. Passwords are read by the
// shell from variables, never printed.
func (a *app) brokerUsers(_ context.Context, args []string) error {
	fs := a.flags()
	userPrefix := fs.String("user-prefix", "sas-", "user names are this prefix and the service's name")
	vhost := fs.String("vhost", "/", "RabbitMQ virtual host")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	perms, what, err := a.brokerPermissions()
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "# RabbitMQ users for sas (%s). Set the password variables, then run these lines.\n", what)
	for _, p := range perms {
		user := *userPrefix + p.Service
		pw := "SAS_AMQP_PASSWORD_" + strings.ToUpper(p.Service)
		fmt.Fprintf(a.stdout, "rabbitmqctl add_user %s \"$%s\" || rabbitmqctl change_password %s \"$%s\"\n", shellQuote(user), pw, shellQuote(user), pw)
		fmt.Fprintf(a.stdout, "rabbitmqctl set_permissions -p %s %s %s %s %s\n", shellQuote(*vhost), shellQuote(user),
			shellQuote(p.Configure), shellQuote(p.Write), shellQuote(p.Read))
	}
	return nil
}

// brokerPermissions is what each service's broker user may do: in a
// partitioned deployment (SAS_PARTITIONS_FILE), under every partition's
// prefix and on the routing exchange; else under SAS_QUEUE_PREFIX.
func (a *app) brokerPermissions() ([]broker.Permission, string, error) {
	l, err := a.layout()
	if err != nil || l == nil {
		return broker.Permissions(a.cfg.QueuePrefix), fmt.Sprintf("queue prefix %q", a.cfg.QueuePrefix), err
	}
	var prefixes []string
	for _, p := range l.Partitions {
		prefixes = append(prefixes, p.QueuePrefix)
	}
	return broker.PartitionedPermissions(prefixes, l.Exchange), fmt.Sprintf("partitions %s, routing exchange %q", strings.Join(prefixes, " "), l.Exchange), nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
