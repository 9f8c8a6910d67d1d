// Readiness probe for scripts/kafka.sh, compiled once into the jar cache.
//
//   java -cp "<cache>/probe:<cache>/*" KafkaReady BOOTSTRAP TIMEOUT_SECONDS [WARMUP_GROUP]
//
// Exit 0 when the broker at BOOTSTRAP is registered and answers metadata
// (DescribeCluster + ListTopics) and, if WARMUP_GROUP is given, when the group
// coordinator answers for it. The latter makes the broker create and load
// __consumer_offsets now, so the first consumer group of a test does not hit
// COORDINATOR_NOT_AVAILABLE (kafka-go's Reader then sleeps JoinGroupBackoff,
// 5s by default). Exit 1: not ready before the deadline.
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.errors.GroupIdNotFoundException;

public class KafkaReady {
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: KafkaReady BOOTSTRAP TIMEOUT_SECONDS [WARMUP_GROUP]");
            System.exit(2);
        }
        String bootstrap = args[0];
        long deadline = System.nanoTime() + Long.parseLong(args[1]) * 1_000_000_000L;
        String group = args.length > 2 ? args[2] : null;

        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "kafka-sh-ready");
        p.put("request.timeout.ms", "2000");
        p.put("default.api.timeout.ms", "3000");
        p.put("retry.backoff.ms", "100");
        p.put("retry.backoff.max.ms", "200");
        p.put("reconnect.backoff.ms", "50");
        p.put("reconnect.backoff.max.ms", "200");
        p.put("socket.connection.setup.timeout.ms", "1000");
        p.put("socket.connection.setup.timeout.max.ms", "1000");

        Throwable last = null;
        try (Admin admin = Admin.create(p)) {
            while (true) {
                try {
                    Collection<Node> nodes = admin.describeCluster().nodes().get();
                    if (!nodes.isEmpty()) {
                        admin.listTopics().names().get();
                        break;
                    }
                    last = new IllegalStateException("no live brokers in metadata");
                } catch (ExecutionException e) {
                    last = e.getCause();
                }
                if (System.nanoTime() > deadline) {
                    System.err.println("KafkaReady: broker not serving metadata: " + last);
                    System.exit(1);
                }
                Thread.sleep(100);
            }
            if (group == null) {
                return;
            }
            while (true) {
                try {
                    admin.describeConsumerGroups(List.of(group)).all().get();
                    return;
                } catch (ExecutionException e) {
                    if (e.getCause() instanceof GroupIdNotFoundException) {
                        return; // coordinator found and answering
                    }
                    last = e.getCause();
                }
                if (System.nanoTime() > deadline) {
                    System.err.println("KafkaReady: group coordinator not available: " + last);
                    System.exit(1);
                }
                Thread.sleep(100);
            }
        }
    }
}
