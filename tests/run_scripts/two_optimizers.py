"""Two optimizers stepping once each per iteration (like Muon + AdamW): one step per iteration."""

import torch

encoder = torch.nn.Linear(8, 8)
decoder = torch.nn.Linear(8, 1)
encoder_optimizer = torch.optim.SGD(encoder.parameters(), lr=0.01)
decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=0.001)
for _ in range(12):
    loss = decoder(torch.relu(encoder(torch.randn(4, 8)))).pow(2).mean()
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
