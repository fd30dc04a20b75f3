//! The `holders` message (PROTOCOL.md), field by field.

use serde_json::{Map, Value};

use super::{Fields, Res};
use crate::job::holders::{HolderChain, HolderExample, HoldersReport, MAX_CHAINS, MAX_LINKS};
use crate::job::message::Message;

impl Fields<'_> {
    fn f64_of(&self, path: &str, v: &Value) -> Res<f64> {
        v.as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.expected(path, "a number", v))
    }

    pub(super) fn holders(&self, o: &Map<String, Value>) -> Res<Message> {
        let chains = self.array(o, "", "chains")?;
        if chains.len() > MAX_CHAINS {
            return Err(self.bound(format!(
                "`chains`: {} chains, more than the {MAX_CHAINS} a reader keeps",
                chains.len()
            )));
        }
        let chains = chains
            .iter()
            .enumerate()
            .map(|(i, c)| self.chain(&format!("chains[{i}]"), c))
            .collect::<Res<_>>()?;
        Ok(Message::Holders(Box::new(HoldersReport {
            seq: self.u64(o, "", "seq")?,
            step: self.opt(o, "", "step", |p, v| self.u64_of(p, v))?,
            allocated: self.opt(o, "", "allocated", |p, v| self.u64_of(p, v))?,
            reason: self.str(o, "", "reason")?,
            budget_ms: self.opt(o, "", "budget_ms", |p, v| self.f64_of(p, v))?,
            spent_ms: self.opt(o, "", "spent_ms", |p, v| self.f64_of(p, v))?,
            complete: self.bool(o, "", "complete")?,
            chains,
        })))
    }

    fn chain(&self, path: &str, v: &Value) -> Res<HolderChain> {
        let c = self.object(path, v)?;
        let links = self.array(c, path, "path")?;
        if links.len() > MAX_LINKS {
            return Err(self.bound(format!(
                "`{path}.path`: {} links, more than the {MAX_LINKS} a reader keeps",
                links.len()
            )));
        }
        let links = links
            .iter()
            .enumerate()
            .map(|(i, l)| self.str_of(&format!("{path}.path[{i}]"), l))
            .collect::<Res<_>>()?;
        let example = self.opt(c, path, "example", |p, v| {
            let e = self.object(p, v)?;
            Ok(HolderExample {
                link: self.str(e, p, "link")?,
                what: self.str(e, p, "what")?,
                graph_bytes: self
                    .opt(e, p, "graph_bytes", |p, v| self.u64_of(p, v))?
                    .unwrap_or(0),
            })
        })?;
        Ok(HolderChain {
            at: self.str(c, path, "where")?,
            path: links,
            holder: self.str(c, path, "holder")?,
            items: self.opt(c, path, "items", |p, v| self.u64_of(p, v))?,
            tensors: self.u64(c, path, "tensors")?,
            bytes: self.u64(c, path, "bytes")?,
            graph_bytes: self
                .opt(c, path, "graph_bytes", |p, v| self.u64_of(p, v))?
                .unwrap_or(0),
            graph_complete: self
                .opt(c, path, "graph_complete", |p, v| {
                    v.as_bool()
                        .ok_or_else(|| self.expected(p, "true or false", v))
                })?
                .unwrap_or(true),
            grew_bytes: self.opt(c, path, "grew_bytes", |p, v| self.i64_of(p, v))?,
            example,
            what: self.opt(c, path, "what", |p, v| self.str_of(p, v))?,
            fix: self.opt(c, path, "fix", |p, v| self.str_of(p, v))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::job::message::{decode, Message};

    fn holders(json: &str) -> Result<Option<Message>, crate::job::LiveError> {
        decode("job", 7, json.as_bytes())
    }

    const CHAIN: &str = r#"{"where":"train.py:42 in train","path":["self",".history"],"holder":"list",
        "items":1601,"tensors":1601,"bytes":819712,"graph_bytes":12897484,"graph_complete":true,
        "grew_bytes":8192,"example":{"link":"[1600]","what":"0-dim tensor float32, grad_fn=AddBackward0",
        "graph_bytes":12897484},"what":null,"fix":"self.history.append(x.item())"}"#;

    #[test]
    fn a_chain_reads_as_the_line_people_read() {
        let json = format!(
            r#"{{"t":"holders","seq":5,"step":17,"reason":"grew","budget_ms":25.0,"spent_ms":3.2,"complete":true,"chains":[{CHAIN}]}}"#
        );
        let Ok(Some(Message::Holders(r))) = holders(&json) else {
            panic!("decodes");
        };
        assert_eq!(r.step, Some(17));
        assert_eq!(
            r.chains[0].text(),
            "train.py:42 in train: self.history (list, 1,601 items) → [1600]: 0-dim tensor \
             float32, grad_fn=AddBackward0, its graph keeps 12.30 MiB of saved tensors"
        );
        let f = &r.findings()[0];
        assert_eq!(f.root, "self.history");
        assert_eq!(f.kind, crate::leak::FindingKind::GrowingHolder);
        assert_eq!(f.growth_per_iter, 8192);
        // The last walk was at step 13: 8 KiB over four steps.
        assert_eq!(r.findings_since(Some(13))[0].growth_per_iter, 2048);
        assert_eq!(f.bytes, 819712 + 12897484);
        assert!(
            f.evidence.contains("at step 17 (3.2 ms of a 25 ms budget)"),
            "{}",
            f.evidence
        );
    }

    #[test]
    fn a_bad_chain_is_named_with_its_field() {
        let bad = CHAIN.replace(r#""tensors":1601"#, r#""tensors":"many""#);
        let json = format!(
            r#"{{"t":"holders","seq":5,"reason":"grew","complete":true,"chains":[{bad}]}}"#
        );
        let err = holders(&json).expect_err("refused").to_string();
        assert!(err.contains("chains[0].tensors"), "{err}");
        let many = vec![CHAIN; 65].join(",");
        let json = format!(
            r#"{{"t":"holders","seq":5,"reason":"grew","complete":true,"chains":[{many}]}}"#
        );
        let err = holders(&json).expect_err("refused").to_string();
        assert!(err.contains("more than the 64"), "{err}");
    }
}
