# RabbitMQ users for sas (queue prefix "sas."). Set the password variables, then run these lines.
rabbitmqctl add_user 'sas-submitter' "$SAS_AMQP_PASSWORD_SUBMITTER" || rabbitmqctl change_password 'sas-submitter' "$SAS_AMQP_PASSWORD_SUBMITTER"
rabbitmqctl set_permissions -p '/' 'sas-submitter' '^(sas\.(dlx|status|alerts)|sas\.submit(\.dlq)?)$' '^sas\.(dlx|submit(\.dlq)?)$' '^sas\.(dlx|submit)$'
rabbitmqctl add_user 'sas-scheduler' "$SAS_AMQP_PASSWORD_SCHEDULER" || rabbitmqctl change_password 'sas-scheduler' "$SAS_AMQP_PASSWORD_SCHEDULER"
rabbitmqctl set_permissions -p '/' 'sas-scheduler' '^(sas\.(dlx|status|alerts)|sas\.(replies|signals)(\.dlq)?|sas\.agent\.[^.]+(\.dlq)?)$' '^(amq\.default|sas\.(dlx|status|alerts|replies(\.dlq)?|signals(\.dlq)?)|sas\.agent\.[^.]+\.dlq)$' '^(sas\.(dlx|replies|signals)|sas\.agent\.[^.]+)$'
rabbitmqctl add_user 'sas-agent' "$SAS_AMQP_PASSWORD_AGENT" || rabbitmqctl change_password 'sas-agent' "$SAS_AMQP_PASSWORD_AGENT"
rabbitmqctl set_permissions -p '/' 'sas-agent' '^(sas\.(dlx|status|alerts)|sas\.replies(\.dlq)?|sas\.agent\.[^.]+(\.dlq)?)$' '^(amq\.default|sas\.(dlx|replies\.dlq)|sas\.agent\.[^.]+(\.dlq)?)$' '^(sas\.(dlx|replies)|sas\.agent\.[^.]+)$'
rabbitmqctl add_user 'sas-sasctl' "$SAS_AMQP_PASSWORD_SASCTL" || rabbitmqctl change_password 'sas-sasctl' "$SAS_AMQP_PASSWORD_SASCTL"
rabbitmqctl set_permissions -p '/' 'sas-sasctl' '^(sas\.(dlx|status|alerts)|sas\.(submit|signals)(\.dlq)?)$' '^(amq\.default|sas\.submit\.dlq)$' '^(sas\.(dlx|submit)|sas\.[^.]+(\.[^.]+)?\.dlq)$'
rabbitmqctl add_user 'sas-api' "$SAS_AMQP_PASSWORD_API" || rabbitmqctl change_password 'sas-api' "$SAS_AMQP_PASSWORD_API"
rabbitmqctl set_permissions -p '/' 'sas-api' '^(sas\.(dlx|status|alerts)|sas\.signals(\.dlq)?|amq\.gen-[^.]+)$' '^(amq\.default|sas\.(dlx|signals(\.dlq)?)|amq\.gen-[^.]+)$' '^(sas\.(dlx|status|signals)|amq\.gen-[^.]+)$'
rabbitmqctl add_user 'sas-app' "$SAS_AMQP_PASSWORD_APP" || rabbitmqctl change_password 'sas-app' "$SAS_AMQP_PASSWORD_APP"
rabbitmqctl set_permissions -p '/' 'sas-app' '^sas\.client\.[^.]+$' '^sas\.(submit|signals)$' '^sas\.client\.[^.]+$'
