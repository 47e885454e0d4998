//! Wire types of inference-mesh.
//!
//! - [`inference`]: the Open Inference Protocol v2 gRPC API (KServe v2) with the
//!   Triton extensions stock clients call (ModelConfig, ModelStatistics, repository).
//! - [`mesh::v1`]: the mesh's own API for internal callers (decisions, features).
#![allow(clippy::all, missing_docs, rust_2018_idioms)]

pub mod features_wire;
pub mod guard;

pub mod inference {
    tonic::include_proto!("inference");
}

pub mod mesh {
    pub mod v1 {
        tonic::include_proto!("mesh.v1");
    }
}

/// Encoded `FileDescriptorSet` of every service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("mesh_descriptor");
