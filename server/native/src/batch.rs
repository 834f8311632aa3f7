//! The HTTP requests Python takes at one wake-up, with the decoded infer requests of one
//! signature merged: one group per model, version, input names, datatypes and shapes after
//! the batch dimension, and requested outputs, whose inputs are concatenated along the batch
//! dimension (Python runs a group as one request and hands back one set of outputs, which
//! `kserve::encode` cuts into each member's response).

use std::collections::HashMap;

use bytes::Bytes;
use tokio::time::Instant;

use crate::http::Item;
use crate::kserve::{Dtype, Requested};

/// One member of a group: its request id, rows, arrival and the `id` its client gave.
pub struct Member {
    pub id: u64,
    pub rows: usize,
    pub arrived: Instant,
    pub request_id: String,
}

/// One input of a group: its parts (one per member, in member order) make one tensor of
/// `shape` (the first dimension summed over the members).
pub struct GroupInput {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub parts: Vec<Bytes>,
}

/// Decoded infer requests run together.
pub struct Group {
    pub model: String,
    pub version: String,
    pub members: Vec<Member>,
    pub inputs: Vec<GroupInput>,
    pub outputs: Option<Vec<Requested>>,
    pub binary_output: bool,
}

/// What Python takes, in arrival order (a group where its first member came).
pub enum Taken {
    Item(Item),
    Group(Group),
}

type Key = (String, String, Vec<(String, Dtype, Vec<usize>)>, Option<Vec<Requested>>, bool);

/// `items` with the decoded infer requests that share a signature merged into groups.
pub fn group(items: Vec<Item>) -> Vec<Taken> {
    let mut taken: Vec<Taken> = Vec::with_capacity(items.len());
    let mut open: HashMap<Key, usize> = HashMap::new();
    for item in items {
        let Item::Infer { id, model, version, decoded, arrived } = item else {
            taken.push(Taken::Item(item));
            continue;
        };
        let rows = decoded.rows();
        let member = Member { id, rows: rows.unwrap_or(0), arrived, request_id: decoded.id };
        let key: Option<Key> = rows.map(|_| {
            let signature = decoded.inputs.iter().map(|t| (t.name.clone(), t.dtype, t.shape[1..].to_vec())).collect();
            (model.clone(), version.clone(), signature, decoded.outputs.clone(), decoded.binary_output)
        });
        if let Some(&at) = key.as_ref().and_then(|key| open.get(key)) {
            let Taken::Group(group) = &mut taken[at] else { unreachable!("open keys point at groups") };
            for (input, tensor) in group.inputs.iter_mut().zip(decoded.inputs) {
                input.shape[0] += member.rows;
                input.parts.push(tensor.data);
            }
            group.members.push(member);
            continue;
        }
        if let Some(key) = key {
            open.insert(key, taken.len());
        }
        let inputs = decoded
            .inputs
            .into_iter()
            .map(|t| GroupInput { name: t.name, dtype: t.dtype, shape: t.shape, parts: vec![t.data] })
            .collect();
        taken.push(Taken::Group(Group {
            model,
            version,
            members: vec![member],
            inputs,
            outputs: decoded.outputs,
            binary_output: decoded.binary_output,
        }));
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::{Decoded, Tensor};

    fn infer(id: u64, model: &str, rows: usize, cols: usize, binary: bool) -> Item {
        let data = Bytes::from(vec![id as u8; rows * cols * 4]);
        let tensor = Tensor { name: "X".into(), dtype: Dtype::F32, shape: vec![rows, cols], data };
        let decoded = Decoded { id: format!("r{id}"), inputs: vec![tensor], outputs: None, binary_output: binary };
        Item::Infer { id, model: model.into(), version: String::new(), decoded, arrived: Instant::now() }
    }

    #[test]
    fn requests_of_one_signature_merge_and_others_stay_apart() {
        let raw = Item::Raw {
            id: 9,
            method: "GET".into(),
            target: Bytes::from_static(b"/v2"),
            headers: vec![],
            body: Bytes::new(),
        };
        let items = vec![infer(1, "m", 2, 3, false), raw, infer(2, "m", 1, 3, false), infer(3, "m", 1, 4, false), infer(4, "n", 1, 3, false), infer(5, "m", 5, 3, true), infer(6, "m", 3, 3, false)];
        let taken = group(items);
        let summary: Vec<String> = taken
            .iter()
            .map(|t| match t {
                Taken::Item(item) => format!("item {}", item.id()),
                Taken::Group(g) => format!(
                    "{} {:?} {:?}",
                    g.model,
                    g.members.iter().map(|m| (m.id, m.rows)).collect::<Vec<_>>(),
                    g.inputs[0].shape
                ),
            })
            .collect();
        assert_eq!(
            summary,
            [
                "m [(1, 2), (2, 1), (6, 3)] [6, 3]",
                "item 9",
                "m [(3, 1)] [1, 4]",
                "n [(4, 1)] [1, 3]",
                "m [(5, 5)] [5, 3]"
            ]
        );
        let Taken::Group(first) = &taken[0] else { panic!() };
        let bytes: Vec<u8> = first.inputs[0].parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(bytes.len(), 6 * 3 * 4);
        assert_eq!((bytes[0], bytes[2 * 12], bytes[3 * 12]), (1, 2, 6)); // member order kept
        assert_eq!(first.members[2].request_id, "r6");
    }
}
