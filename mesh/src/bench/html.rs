//! `mesh bench --html`: the bench report as one self-contained HTML page. The
//! page is `report.html` with its `{{NAME}}` placeholders filled; the summary
//! table is written here; the two charts (latency histogram, and
//! percentiles plus throughput per second) are drawn as inline SVG by a small
//! inline script from the report JSON embedded in the page. Nothing is loaded
//! from anywhere else, so the page opens offline.
//!
//! When the script has drawn everything it sets `data-rendered="ok"` on `<body>`
//! and `data-bars` / `data-series` on the chart containers (how many bars and
//! lines it drew); if it throws, `data-rendered="error"` and the message shows on
//! the page. The end-to-end test reads these from headless Chromium.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::Report;

/// The page (`report.html`): the `{{NAME}}` placeholders in it are exactly the
/// names [`values`] fills, in one pass.
const TEMPLATE: &str = include_str!("report.html");

/// The whole page for `report`.
pub fn render(report: &Report) -> String {
    fill(TEMPLATE, &values(report))
}

/// What goes in each placeholder of the page.
fn values(report: &Report) -> [(&'static str, String); 5] {
    let json = serde_json::to_string(report).unwrap_or_else(|e| {
        serde_json::json!({ "error": format!("serializing the report: {e}") }).to_string()
    });
    let title = format!(
        "mesh bench · {} · {} · {:.1} s",
        report.target, report.mode, report.seconds
    );
    let heading = format!("mesh bench: {}", report.target);
    let subtitle = format!(
        "{} · {:.1} s · {} requests",
        report.mode,
        report.seconds,
        group(report.requests)
    );
    [
        ("TITLE", escape(&title)),
        ("HEADING", escape(&heading)),
        ("SUBTITLE", escape(&subtitle)),
        ("SUMMARY", summary(report)),
        ("REPORT_JSON", embed_json(&json)),
    ]
}

/// JSON made safe inside `<script>`: `<` only occurs in JSON strings, where
/// `\u003c` means the same, so no `</script>` or `<!--` can end the element.
pub fn embed_json(json: &str) -> String {
    json.replace('<', "\\u003c")
}

/// Replaces each `{{NAME}}` in one pass (values are not searched again).
fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|v| v.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find("}}").and_then(|j| {
            values
                .iter()
                .find(|(k, _)| *k == &after[..j])
                .map(|v| (j, v))
        }) {
            Some((j, (_, v))) => {
                out.push_str(v);
                rest = &after[j + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// 1234567 -> "1,234,567".
fn group(n: u64) -> String {
    let s = n.to_string();
    // Groups of three from the right (digits are ASCII, so any split is UTF-8).
    let groups: Vec<&str> = s
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).unwrap_or_default())
        .collect();
    groups.join(",")
}

fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{} {}", escape(k), group(*v)))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// Stage times in pipeline order, anything else (`other`) after.
fn in_pipeline_order<V>(stages: &BTreeMap<String, V>) -> Vec<(&String, &V)> {
    const ORDER: [&str; 7] = mesh_prediction_log::StageMicros::NAMES;
    let mut by: Vec<(&String, &V)> = stages.iter().collect();
    by.sort_by_key(|(k, _)| ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()));
    by
}

/// The summary tables, as HTML (visible even where scripts do not run).
fn summary(r: &Report) -> String {
    let errors: u64 = r
        .codes
        .iter()
        .filter(|(k, _)| k.as_str() != "OK")
        .map(|(_, v)| *v)
        .sum();
    let us = |v: u64| format!("{} µs", group(v));
    let mut s = String::new();
    s.push_str("<table class=\"summary\">\n<thead><tr><th>requests</th><th>throughput</th>");
    s.push_str("<th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>errors</th></tr></thead>\n");
    let _ = write!(
        s,
        "<tbody><tr><td>{}</td><td>{} req/s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td{}>{}</td></tr></tbody>\n</table>\n",
        group(r.requests),
        group(r.throughput.round().max(0.0) as u64),
        us(r.p50_us),
        us(r.p90_us),
        us(r.p99_us),
        us(r.p999_us),
        us(r.max_us),
        if errors > 0 { " class=\"err\"" } else { "" },
        group(errors),
    );
    s.push_str("<table class=\"details\">\n");
    let _ = writeln!(
        s,
        "<tr><th>target</th><td>{} · {}</td></tr>",
        escape(&r.target),
        escape(&r.mode)
    );
    let _ = writeln!(
        s,
        "<tr><th>status codes</th><td>{}</td></tr>",
        if r.codes.is_empty() {
            "none".to_owned()
        } else {
            counts(&r.codes)
        }
    );
    // The load generator's own delay is inside every latency above.
    let _ = writeln!(
        s,
        "<tr><th>send lag (load generator)</th><td>p99 {} · max {}</td></tr>",
        us(r.send_lag_p99_us),
        us(r.send_lag_max_us)
    );
    if let Some(u) = &r.useful {
        let _ = writeln!(
            s,
            "<tr><th>deadline {} ms</th><td>{} useful answers ({}/s) · {} over 5 ms late{}</td></tr>",
            u.deadline_ms,
            group(u.answers),
            group(u.per_second.round().max(0.0) as u64),
            group(u.late),
            if u.late_codes.is_empty() {
                String::new()
            } else {
                format!(" ({})", counts(&u.late_codes))
            }
        );
    }
    if !r.sources.is_empty() {
        let _ = writeln!(
            s,
            "<tr><th>answer sources</th><td>{}</td></tr>",
            counts(&r.sources)
        );
    }
    if !r.stages_us.is_empty() {
        let text = in_pipeline_order(&r.stages_us)
            .iter()
            .map(|(k, v)| format!("{} {:.0}", escape(k), v))
            .collect::<Vec<_>>()
            .join(" · ");
        let _ = writeln!(
            s,
            "<tr><th>server stages (mean µs)</th><td>{text}</td></tr>"
        );
    }
    if let Some(t) = &r.server {
        // Inside the latencies above: the rest is the way there and back and the
        // load generator.
        let _ = writeln!(
            s,
            "<tr><th>server total (arrival to answer)</th><td>p50 {} · p99 {} · p99.9 {} · max {}</td></tr>",
            us(t.p50_us),
            us(t.p99_us),
            us(t.p999_us),
            us(t.max_us)
        );
        if !t.stages_p99_us.is_empty() {
            let text = in_pipeline_order(&t.stages_p99_us)
                .iter()
                .map(|(k, v)| format!("{} {}", escape(k), us(**v)))
                .collect::<Vec<_>>()
                .join(" · ");
            let _ = writeln!(
                s,
                "<tr><th>server stages (p99 each; other: the rest of the total)</th><td>{text}</td></tr>"
            );
        }
    }
    // --alternate-addr: each server's seconds, as the text report gives them.
    let servers = r.by_server();
    if !servers.is_empty() {
        let text = servers
            .iter()
            .map(|v| v.describe(&escape(&v.addr), us))
            .collect::<Vec<_>>()
            .join(" · ");
        let _ = writeln!(
            s,
            "<tr><th>servers (alternate seconds)</th><td>{text}</td></tr>"
        );
    }
    s.push_str("</table>\n");
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::report::{Bucket, Window};
    use super::*;
    use std::collections::BTreeMap;

    fn report() -> Report {
        Report {
            target: "decide</script><!--x".into(),
            mode: "closed loop, 4 callers".into(),
            seconds: 2.0,
            requests: 1500,
            throughput: 750.0,
            p50_us: 420,
            p90_us: 800,
            p99_us: 2_100,
            p999_us: 9_000,
            max_us: 12_000,
            send_lag_p99_us: 40,
            send_lag_max_us: 300,
            codes: BTreeMap::from([("OK".into(), 1490), ("Unavailable".into(), 10)]),
            sources: BTreeMap::from([("MODEL".into(), 1490)]),
            stages_us: BTreeMap::from([("compute".into(), 110.5), ("validate".into(), 3.0)]),
            server: Some(super::super::report::ServerLatency {
                answers: 1490,
                p50_us: 120,
                p99_us: 1_800,
                p999_us: 4_200,
                max_us: 6_000,
                stages_p99_us: BTreeMap::from([("compute".into(), 900), ("other".into(), 1_100)]),
            }),
            useful: None,
            windows: (0..2)
                .map(|i| Window {
                    t_s: i as f64,
                    seconds: 1.0,
                    requests: 750,
                    errors: 5,
                    throughput: 750.0,
                    p50_us: 400 + i,
                    p90_us: 800,
                    p99_us: 2_000,
                    p999_us: 9_000,
                    max_us: 12_000,
                    server_p99_us: Some(1_700),
                    sent_to: None,
                })
                .collect(),
            histogram: vec![
                Bucket {
                    lower_us: 398.0,
                    upper_us: 501.0,
                    count: 1400,
                },
                Bucket {
                    lower_us: 501.0,
                    upper_us: 631.0,
                    count: 100,
                },
            ],
        }
    }

    #[test]
    fn bench_html_embeds_the_report_and_loads_nothing() {
        let r = report();
        let page = render(&r);
        let json = serde_json::to_string(&r).unwrap();
        assert!(page.contains(&embed_json(&json)), "embedded JSON missing");
        // The JSON round-trips out of its script element.
        let open = "<script type=\"application/json\" id=\"report-data\">";
        let start = page.find(open).unwrap() + open.len();
        let end = start + page[start..].find("</script>").unwrap();
        let back: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
        assert_eq!(back, serde_json::to_value(&r).unwrap());
        assert_eq!(back["windows"].as_array().unwrap().len(), 2);
        // The hostile target neither closes a script nor opens a comment.
        assert_eq!(page.matches("</script>").count(), 2);
        assert!(!page.contains("<!--x"));
        assert!(page.contains("decide&lt;/script&gt;"));
        // Self-contained: no external scripts, styles, fonts or images.
        let lower = page.to_lowercase();
        for bad in [
            "src=\"http",
            "src='http",
            "src=http",
            "href=\"http",
            "href='http",
            "href=http",
            "url(http",
            "url(\"http",
            "url('http",
            "@import",
            "<link",
            "<iframe",
            "src=\"//",
            "href=\"//",
        ] {
            assert!(!lower.contains(bad), "page references {bad}");
        }
        // Filled, and the hooks the e2e test reads are there.
        assert!(!page.contains("{{"), "unfilled placeholder");
        for hook in [
            "id=\"hist-chart\"",
            "id=\"time-chart\"",
            "id=\"tput-chart\"",
            "dataset.rendered = \"ok\"",
        ] {
            assert!(page.contains(hook), "{hook}");
        }
        assert!(page.contains("1,500"));
        assert!(page.contains("9,000 µs"));
        assert!(page.contains("<td>p99 40 µs · max 300 µs</td>"), "send lag");
        assert!(
            page.contains("<tr><th>server total (arrival to answer)</th><td>p50 120 µs · p99 1,800 µs · p99.9 4,200 µs · max 6,000 µs</td></tr>"),
            "server total"
        );
        assert!(
            page.contains("<tr><th>server stages (p99 each; other: the rest of the total)</th><td>compute 900 µs · other 1,100 µs</td></tr>"),
            "server stages p99"
        );
        let mut bare = report();
        bare.server = None;
        assert!(!render(&bare).contains("server total"));
        // No deadline: no useful-answers row; with one, late answers by status.
        assert!(!page.contains("useful answers"));
        let mut r = report();
        r.useful = Some(super::super::report::Useful {
            deadline_ms: 50,
            answers: 1200,
            per_second: 600.0,
            late: 3,
            late_codes: BTreeMap::from([("Cancelled".into(), 2), ("OK".into(), 1)]),
        });
        assert!(render(&r).contains(
            "<tr><th>deadline 50 ms</th><td>1,200 useful answers (600/s) · 3 over 5 ms late (Cancelled 2 · OK 1)</td></tr>"
        ));
    }

    #[test]
    fn bench_html_names_each_server_of_an_alternating_run() {
        let mut r = report();
        assert!(!render(&r).contains("servers (alternate seconds)"));
        let a = "http://127.0.0.1:1".to_owned();
        let b = "http://<b>:2".to_owned();
        r.windows = (0..4u32)
            .map(|i| Window {
                t_s: f64::from(i),
                sent_to: Some(if i % 2 == 0 { a.clone() } else { b.clone() }),
                p99_us: 1_000 * (u64::from(i) + 1),
                server_p99_us: Some(100 * (u64::from(i) + 1)),
                ..r.windows[0].clone()
            })
            .collect();
        let page = render(&r);
        // A's seconds 0 and 2 (p99 1,000 and 3,000 µs: the median takes the upper),
        // B's 1 and 3; the address is escaped.
        assert!(
            page.contains(
                "<tr><th>servers (alternate seconds)</th><td>http://127.0.0.1:1: 2 seconds, \
                 per-second p99 median 3,000 µs, the server's own 300 µs · http://&lt;b&gt;:2: \
                 2 seconds, per-second p99 median 4,000 µs, the server's own 400 µs</td></tr>"
            ),
            "{page}"
        );
    }

    #[test]
    fn bench_html_fill_is_one_pass() {
        let out = fill(
            "a {{X}} b {{Y}} {{Z}} {{",
            &[("X", "{{Y}}".into()), ("Y", "y".into())],
        );
        assert_eq!(out, "a {{Y}} b y {{Z}} {{");
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
    }

    /// The `{{NAME}}` placeholders of a template, in order of appearance.
    fn placeholders(template: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = template;
        while let Some(i) = rest.find("{{") {
            let after = &rest[i + 2..];
            let Some(j) = after.find("}}") else { break };
            out.push(&after[..j]);
            rest = &after[j + 2..];
        }
        out
    }

    #[test]
    fn bench_html_fills_every_placeholder_of_the_template() {
        // The template's placeholders are exactly the names the renderer fills,
        // each one once.
        let mut names = placeholders(TEMPLATE);
        assert_eq!(names.len(), 5, "{names:?}");
        names.sort_unstable();
        let r = report();
        let values = values(&r);
        let mut filled: Vec<&str> = values.iter().map(|(k, _)| *k).collect();
        filled.sort_unstable();
        assert_eq!(names, filled);
        // Every value lands in the page, and no placeholder is left.
        let page = render(&r);
        for (k, v) in &values {
            assert!(!v.is_empty(), "{k} is empty");
            assert!(page.contains(v.as_str()), "{k} missing from the page");
            assert!(!page.contains(&format!("{{{{{k}}}}}")), "{k} left unfilled");
        }
        assert!(placeholders(&page).is_empty(), "{:?}", placeholders(&page));
        // The page is the template around the values: nothing else was dropped.
        let template_len = TEMPLATE.len() - names.iter().map(|n| n.len() + 4).sum::<usize>();
        let values_len: usize = values.iter().map(|(_, v)| v.len()).sum();
        assert_eq!(page.len(), template_len + values_len);
        // The charts' hooks are in the template itself.
        assert!(TEMPLATE.starts_with("<!DOCTYPE html>"));
        assert!(TEMPLATE.contains("<title>{{TITLE}}</title>"));
        assert!(TEMPLATE.contains("id=\"report-data\">{{REPORT_JSON}}</script>"));
    }
}
