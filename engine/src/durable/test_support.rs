//! What the durable module's tests share: a snapshot written to a fresh state directory and
//! read back, and the engine configuration they run on.

use std::path::Path;

use fqdnd_checkpoint::{Options, Seq, SnapshotMeta};
use serde::Serialize;

use super::SCHEMA;

/// `value` written as a snapshot to a new state directory and read back through `decode`
/// (`ReadSnapshot::decode` as a restore reads it, `decode_value` as `checkpoint inspect` does).
pub(super) fn write_and_read<S>(
    value: &(impl Serialize + ?Sized),
    decode: impl FnOnce(&[u8]) -> Result<S, String>,
) -> S {
    let dir = tempfile::tempdir().unwrap();
    let meta = SnapshotMeta {
        next_generation: 1,
        next_seq: Seq(0),
        taken_at_unix_ms: 0,
    };
    fqdnd_checkpoint::write_snapshot(dir.path(), SCHEMA, &meta, value).unwrap();
    let read = fqdnd_checkpoint::read_snapshot_with(dir.path(), &Options::new(SCHEMA), decode);
    read.unwrap().unwrap().1
}

/// One client group (endpoint 7, `127.0.0.0/8`) allowed `*.test`; `settings`, when given, is
/// the body of a `Settings` document put first (`"breakers: {maxCacheEntries: 3}"`, say).
pub(super) fn lan_config(settings: Option<&str>) -> fqdnd_config::Config {
    let settings = settings.map_or_else(String::new, |spec| {
        format!("apiVersion: fqdnd.io/v1\nkind: Settings\nspec:\n  {spec}\n---\n")
    });
    let yaml = format!(
        "{settings}apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec: {{id: 7, addresses: [\"127.0.0.0/8\"], labels: {{site: lan}}}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: lan}}
spec:
  endpointSelector: {{matchLabels: {{site: lan}}}}
  egress:
  - toFQDNs: [{{matchPattern: \"*.test\"}}]
"
    );
    fqdnd_config::load_str(&yaml, Path::new("test.yaml")).unwrap()
}
