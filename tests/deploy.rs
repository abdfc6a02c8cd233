//! The deployment files, checked where no container engine runs: every file the Dockerfile
//! copies, docker-compose mounts and the Kubernetes kustomization reads exists; the
//! refusal-gate configurations in them are valid; and the ports are the local stack's
//! (scripts/stack), which the test command runs for real.

use refusal_gate::config::Config;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn assert_exists(base: &Path, referenced: &str, from: &str) {
    let path = base.join(referenced);
    assert!(
        path.exists(),
        "{from} refers to {referenced}, which does not exist"
    );
}

#[test]
fn every_file_the_deployment_refers_to_exists() {
    let root = root();
    // Dockerfile: the sources of every COPY that is not from a build stage (context: root).
    let dockerfile = read("deploy/Dockerfile");
    let mut copies = 0;
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ")) {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        for source in &words[..words.len() - 1] {
            assert_exists(&root, source, "deploy/Dockerfile");
            copies += 1;
        }
    }
    assert!(copies >= 5, "the Dockerfile copies the sources");

    // docker-compose.yml: every host path it mounts (relative to deploy/).
    let compose = read("deploy/docker-compose.yml");
    let mounts: Vec<&str> = compose
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- ../"))
        .filter_map(|l| l.split(':').next())
        .collect();
    assert!(mounts.len() >= 6, "{mounts:?}");
    for m in mounts {
        assert_exists(&root, m, "deploy/docker-compose.yml");
    }
    assert_exists(
        &root.join("deploy"),
        "Dockerfile",
        "deploy/docker-compose.yml",
    );

    // kustomization.yaml: its resources and the files of its config maps.
    let kustomization = read("deploy/k8s/kustomization.yaml");
    let k8s = root.join("deploy/k8s");
    let mut referenced = 0;
    for line in kustomization.lines() {
        // List items that are paths (`- name: …` items are config maps).
        let Some(item) = line.trim().strip_prefix("- ").filter(|i| !i.contains(": ")) else {
            continue;
        };
        let path = item.split_once('=').map_or(item, |(_, p)| p);
        assert_exists(&k8s, path, "deploy/k8s/kustomization.yaml");
        referenced += 1;
    }
    assert!(referenced >= 4);
}

#[test]
fn the_shipped_configurations_are_valid() {
    for path in [
        "deploy/refusal-gate.yaml",
        "deploy/k8s/refusal-gate-config.yaml",
        "deploy/scaleout/count-2.yaml",
    ] {
        Config::parse(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

#[test]
fn the_joiners_join_and_forward_to_the_collectors_second_pipeline() {
    use refusal_gate::config::Role;
    for (path, collector, port) in [
        (
            "deploy/k8s/refusal-gate-join-config.yaml",
            "deploy/k8s/collector.yaml",
            "4319",
        ),
        (
            "deploy/scaleout/join-0.yaml",
            "deploy/scaleout/collector.yaml",
            "14319",
        ),
        (
            "deploy/scaleout/join-1.yaml",
            "deploy/scaleout/collector.yaml",
            "14319",
        ),
    ] {
        let joiner = Config::parse(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(joiner.tracker.role, Role::Join, "{path}");
        let to = joiner.exporters.otlp.expect("forwards").endpoint;
        assert!(to.ends_with(&format!(":{port}")), "{path}: {to}");
        let collector = read(collector);
        assert!(collector.contains(&format!(":{port} }}")), "{collector}");
        assert!(collector.contains("routing_attributes: [refusal_gate.client]"));
    }
    // The compose profile's Collector routes to the joiners' and the counters' ports.
    let collector = read("deploy/scaleout/collector.yaml");
    for port in ["24317", "25317", "4317", "34317"] {
        assert!(collector.contains(&format!("127.0.0.1:{port}")), "{port}");
    }
    let k8s = read("deploy/k8s/refusal-gate.yaml");
    assert!(k8s.contains("name: refusal-gate-join-headless"));
    assert!(read("deploy/k8s/collector.yaml").contains("refusal-gate-join-headless"));
}

#[test]
fn every_deployment_uses_the_local_stacks_ports() {
    let stack = read("scripts/stack");
    let defaults = Config::default();
    assert_eq!(defaults.receivers.otlp.grpc.endpoint.port(), 4317);
    assert_eq!(defaults.receivers.otlp.http.endpoint.port(), 4318);
    assert_eq!(defaults.admin.endpoint.port(), 9464);
    let local = Config::parse(&read("deploy/refusal-gate.yaml")).expect("valid");
    assert_eq!(
        local.admin.endpoint.port(),
        9464,
        "the stack's refusal-gate"
    );
    let alertmanager = local
        .alerting
        .alertmanager
        .expect("alerts go to Alertmanager");
    assert_eq!(alertmanager.url, "http://127.0.0.1:9093");
    for port in ["4317", "4318", "9464", "9090", "9093"] {
        assert!(stack.contains(port), "scripts/stack: {port}");
    }
    let compose = read("deploy/docker-compose.yml");
    for port in ["4317", "4318", "9464", "127.0.0.1:9090", "127.0.0.1:9093"] {
        assert!(compose.contains(port), "docker-compose.yml: {port}");
    }
    assert!(read("dashboards/prometheus/prometheus.yml").contains("127.0.0.1:9464"));
    assert!(read("dashboards/prometheus/prometheus.yml").contains("127.0.0.1:9093"));
    let k8s = read("deploy/k8s/refusal-gate.yaml");
    for port in [
        "containerPort: 4317",
        "containerPort: 4318",
        "containerPort: 9464",
    ] {
        assert!(k8s.contains(port), "refusal-gate.yaml: {port}");
    }
    let in_cluster = Config::parse(&read("deploy/k8s/refusal-gate-config.yaml")).expect("valid");
    assert_eq!(in_cluster.receivers.otlp.grpc.endpoint.port(), 4317);
    assert_eq!(in_cluster.receivers.otlp.http.endpoint.port(), 4318);
    assert_eq!(in_cluster.admin.endpoint.port(), 9464);
    assert!(read("deploy/k8s/collector.yaml").contains("refusal-gate-headless"));
    assert!(k8s.contains("name: refusal-gate-headless") && k8s.contains("clusterIP: None"));
}
