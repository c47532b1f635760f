//! What every experiment prints: its tables, its targets (one line each,
//! `target <name>: <measured> (goal <goal>) PASS|MISS`), and the same figures
//! as JSON with `--json PATH`.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

/// One experiment's results.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The experiment's name, as given to `critio bench`.
    pub experiment: String,
    /// One line on what was measured and how.
    pub description: String,
    /// The tables, in print order.
    pub tables: Vec<Table>,
    /// The targets, computed from the measurements above.
    pub targets: Vec<Target>,
}

/// `a` over `b`, a target's ratio; a `b` of zero (nothing measured)
/// counts as a nanosecond's worth, so the ratio stays finite.
pub fn ratio(a: f64, b: f64) -> f64 {
    a / b.max(1e-9)
}

/// A table of measurements; cells are JSON values so the JSON keeps numbers.
#[derive(Debug, Serialize)]
pub struct Table {
    /// Printed above the table.
    pub title: String,
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows of cells, one per column.
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    /// An empty table.
    pub fn new(title: &str, columns: &[&str]) -> Self {
        Self {
            title: title.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; it must have one cell per column.
    pub fn row(&mut self, cells: Vec<Value>) {
        assert_eq!(cells.len(), self.columns.len(), "row width != columns");
        self.rows.push(cells);
    }

    /// The wait points of critical tasks in `snap` (paper 000 Tables 2-3):
    /// one row per wait point, waits, mean and max.
    pub fn wait_points(title: &str, snap: &critio::metrics::MetricsSnapshot) -> Self {
        let mut t = Table::new(
            title,
            &["wait point (critical)", "waits", "mean ms", "max ms"],
        );
        for w in &snap.wait_points {
            if w.class == critio::context::Class::Critical {
                t.row(vec![
                    Value::from(w.point.clone()),
                    Value::from(w.latency.count),
                    Value::from(w.latency.mean_us / 1000.0),
                    Value::from(w.latency.max_us / 1000.0),
                ]);
            }
        }
        t
    }

    fn render(&self) -> String {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(fmt_cell).collect())
            .collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r[i].len())
                    .chain([self.columns[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = format!("{}\n", self.title);
        let line = |cols: &[String]| {
            let mut s = String::new();
            for (i, c) in cols.iter().enumerate() {
                if i == 0 {
                    let _ = write!(s, "{:<w$}", c, w = widths[i]);
                } else {
                    let _ = write!(s, "  {:>w$}", c, w = widths[i]);
                }
            }
            s.trim_end().to_owned() + "\n"
        };
        out += &line(&self.columns);
        for r in &cells {
            out += &line(r);
        }
        out
    }
}

fn fmt_cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        // Not measured (an optional column's missing value).
        Value::Null => "-".to_owned(),
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x.abs() >= 100.0 {
                format!("{x:.0}")
            } else if x.abs() >= 1.0 {
                format!("{x:.2}")
            } else {
                format!("{x:.3}")
            }
        }
        other => other.to_string(),
    }
}

/// What a target requires of its measured value.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    /// The measured value must be at most this.
    AtMost(f64),
    /// The measured value must be at least this.
    AtLeast(f64),
}

/// One target line.
#[derive(Debug, Serialize)]
pub struct Target {
    /// Short name, e.g. `uncontended-ratio`.
    pub name: String,
    /// What was measured in this run.
    pub measured: f64,
    /// What it must be.
    pub goal: Goal,
    /// Unit printed after the numbers (`x`, `%`, `ms`).
    pub unit: String,
    /// Whether the measured value meets the goal.
    pub pass: bool,
}

impl Target {
    /// A target; `pass` is computed here, from `measured` and `goal`.
    pub fn new(name: &str, measured: f64, goal: Goal, unit: &str) -> Self {
        let pass = match goal {
            Goal::AtMost(g) => measured <= g,
            Goal::AtLeast(g) => measured >= g,
        };
        Self {
            name: name.to_owned(),
            measured,
            goal,
            unit: unit.to_owned(),
            pass,
        }
    }

    /// The printed line: two decimals, or as many more (up to six) as it
    /// takes for a value that is not the goal not to print as the goal (a
    /// ratio of 0.7986 against a goal of 0.8 printed "0.80x (goal >=
    /// 0.80x) MISS").
    pub fn line(&self) -> String {
        let (op, g) = match self.goal {
            Goal::AtMost(g) => ("<=", g),
            Goal::AtLeast(g) => (">=", g),
        };
        let mut digits = 2;
        while digits < 6
            && self.measured != g
            && format!("{:.*}", digits, self.measured) == format!("{:.*}", digits, g)
        {
            digits += 1;
        }
        format!(
            "target {}: {:.*}{u} (goal {op} {:.*}{u}) {}",
            self.name,
            digits,
            self.measured,
            digits,
            g,
            if self.pass { "PASS" } else { "MISS" },
            u = self.unit
        )
    }
}

impl Report {
    /// Everything as printed on the terminal.
    pub fn render(&self) -> String {
        let mut out = format!("== {} ==\n{}\n\n", self.experiment, self.description);
        for t in &self.tables {
            out += &t.render();
            out.push('\n');
        }
        for t in &self.targets {
            out += &t.line();
            out.push('\n');
        }
        out
    }

    /// Writes the report as JSON.
    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn target_lines_are_computed_from_the_measurement() {
        let t = Target::new("ratio", 1.5, Goal::AtMost(2.0), "x");
        assert_eq!(t.line(), "target ratio: 1.50x (goal <= 2.00x) PASS");
        let t = Target::new("kept", 40.0, Goal::AtLeast(50.0), "%");
        assert_eq!(t.line(), "target kept: 40.00% (goal >= 50.00%) MISS");
    }

    #[test]
    fn a_value_just_short_of_its_goal_does_not_print_as_the_goal() {
        let t = Target::new("get", 43418.0 / 54368.0, Goal::AtLeast(0.8), "x");
        assert_eq!(t.line(), "target get: 0.799x (goal >= 0.800x) MISS");
        let t = Target::new("p99", 2.0004, Goal::AtMost(2.0), "x");
        assert_eq!(t.line(), "target p99: 2.0004x (goal <= 2.0000x) MISS");
        let t = Target::new("met", 0.8, Goal::AtLeast(0.8), "x");
        assert_eq!(t.line(), "target met: 0.80x (goal >= 0.80x) PASS");
    }

    #[test]
    fn tables_align_and_json_keeps_numbers() {
        let mut t = Table::new("T", &["name", "ns/op"]);
        t.row(vec![json!("critio"), json!(12.345)]);
        let r = Report {
            experiment: "x".into(),
            description: "d".into(),
            tables: vec![t],
            targets: vec![Target::new("a", 1.0, Goal::AtLeast(1.0), "x")],
        };
        let text = r.render();
        assert!(text.contains("critio  12.35"), "{text}");
        assert!(text.ends_with("target a: 1.00x (goal >= 1.00x) PASS\n"));
        let v: Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["tables"][0]["rows"][0][1], json!(12.345));
        assert_eq!(v["targets"][0]["pass"], json!(true));
    }

    #[test]
    fn a_value_not_measured_prints_as_a_dash_and_stays_null_in_json() {
        let mut t = Table::new("T", &["name", "steal %"]);
        t.row(vec![json!("here"), json!(None::<f64>)]);
        let text = t.render();
        let last = text.lines().last().unwrap_or_default();
        assert!(last.starts_with("here") && last.ends_with(" -"), "{text}");
        assert_eq!(serde_json::to_value(&t).unwrap()["rows"][0][1], Value::Null);
    }
}
