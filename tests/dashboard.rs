//! The Grafana dashboard and its provisioning: the violation panels ask Prometheus for
//! exemplars, and a trace is a click away in Tempo (the `tempo` variable, the data source's
//! `exemplarTraceIdDestinations`); and Grafana's own published schema reads the dashboard
//! whole. No Grafana server runs here, so the schema is checked by
//! `tests/agents/dashboard_schema.py` with the models of `grafana-foundation-sdk` (generated
//! from Grafana 11.6's schemas, pinned in `tests/agents/requirements.txt`), in the agents'
//! virtual environment the README's test command makes; planted mistakes show what it catches.
//! (The PromQL of every panel runs against a real Prometheus in `tests/alerting.rs`.)

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("dashboards/grafana/refusal-gate.json")).expect("JSON")
}

#[test]
fn the_violation_panels_show_exemplars_that_open_their_trace_in_tempo() {
    let d = dashboard();
    let mut asked = 0;
    for panel in d["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            if expr.contains("refusal_gate_violations_total") && panel["type"] == "timeseries" {
                assert_eq!(
                    target["exemplar"], true,
                    "{}: {expr} asks for exemplars",
                    panel["title"]
                );
                asked += 1;
            }
        }
    }
    assert!(asked >= 3, "the violation panels: {asked}");

    let variables = d["templating"]["list"].as_array().expect("variables");
    let tempo = variables
        .iter()
        .find(|v| v["name"] == "tempo")
        .expect("a tempo variable");
    assert_eq!(tempo["type"], "datasource");
    assert_eq!(tempo["query"], "tempo", "it lists the Tempo data sources");
    let links = d["links"].as_array().expect("dashboard links");
    assert!(
        links
            .iter()
            .any(|l| l["url"].as_str().is_some_and(|u| u.contains("${tempo}"))),
        "a link to the traces in the chosen Tempo: {links:?}"
    );

    // An exemplar's own link: the Prometheus data source sends its trace_id to Tempo.
    let provisioning: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read(
        "dashboards/grafana/provisioning/datasources/prometheus.yml",
    ))
    .expect("YAML");
    let sources = provisioning["datasources"]
        .as_sequence()
        .expect("datasources");
    let of_type = |t: &str| {
        sources
            .iter()
            .find(|s| s["type"].as_str() == Some(t))
            .unwrap_or_else(|| panic!("a {t} data source"))
    };
    let destination = &of_type("prometheus")["jsonData"]["exemplarTraceIdDestinations"][0];
    assert_eq!(destination["name"].as_str(), Some("trace_id"));
    assert_eq!(
        destination["datasourceUid"].as_str(),
        of_type("tempo")["uid"].as_str(),
        "the destination is the provisioned Tempo"
    );
}

/// Runs the schema check on `dashboard` (JSON text): whether it passed, and what it printed.
fn schema_check(python: &str, dashboard: &str, tag: &str) -> (bool, String) {
    let dir = common::fresh_dir("dashboard", tag);
    let path = dir.join("dashboard.json");
    std::fs::write(&path, dashboard).expect("writing the dashboard");
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/dashboard_schema.py"))
        .arg(&path)
        .output()
        .expect("the schema check runs");
    let _ = std::fs::remove_dir_all(&dir);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

#[test]
fn grafanas_published_schema_reads_the_whole_dashboard() {
    let Some(python) = common::agent_python() else {
        return;
    };
    let shipped = read("dashboards/grafana/refusal-gate.json");
    let (ok, printed) = schema_check(&python, &shipped, "shipped");
    assert!(ok && printed.trim().is_empty(), "{printed}");

    // What it catches: a misspelled field (dropped by the schema), a value of the wrong
    // type, a value outside an enum, a panel type Grafana has no plugin for.
    for (planted, from, to, named) in [
        (
            "a misspelled field",
            "\"exemplar\": true",
            "\"exemplars\": true",
            ".exemplars: not in the schema",
        ),
        (
            "a string for a boolean",
            "\"exemplar\": true",
            "\"exemplar\": \"true\"",
            ".exemplar: 'true'",
        ),
        (
            "a variable type that does not exist",
            "\"type\": \"datasource\",",
            "\"type\": \"data_source\",",
            "is not a VariableType",
        ),
        (
            "a panel type with no plugin",
            "\"type\": \"timeseries\"",
            "\"type\": \"time_series\"",
            "is no panel the schema knows",
        ),
    ] {
        assert!(
            shipped.contains(from),
            "{planted}: {from} is in the dashboard"
        );
        let (ok, printed) = schema_check(&python, &shipped.replacen(from, to, 1), "planted");
        assert!(
            !ok && printed.contains(named),
            "{planted} ({to}) is caught: {printed}"
        );
    }
}
